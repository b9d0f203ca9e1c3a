"""The base: what every stage stands on, in the standard library only.

Typed errors (:mod:`.errors`: each failure's kind, exit code and the message naming file, rows,
values and fix), the range of every number that enters from outside (:mod:`.limits`), strict
JSON (:mod:`.jsonio`), modperf's own version (:mod:`.meta`) and the one write path
(:mod:`.atomic`: a temporary file beside the target, fsync, verify, rename).

May import: the standard library.
"""
