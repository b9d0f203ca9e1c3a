"""A question's way out: fields in, one answer (or a vectorised batch of them) out.

The grid (:mod:`.interp`), answerability and substitution (:mod:`.deployment`), what a model
fixes (:mod:`.resolve`), the engine (:mod:`.engine`), batch lines (:mod:`.lines`) and the
:class:`~modperf.query.db.Database` facade (:mod:`.db`).

May import: numpy, pyarrow; modperf.base, modperf.fast, modperf.specs, modperf.data.
"""
