"""A table's way in: from a file under a data root to a keyed table a question can use.

The catalog (:mod:`.catalog`), the one reader (:mod:`.reader`), the family declarations
(:mod:`.families`), conventions and validation (:mod:`.conventions`, :mod:`.validate`), keying
(:mod:`.codes`, :mod:`.buckets`, :mod:`.keyed_guards`), the loader (:mod:`.loader`), the
persisted keyed tables and catalog scans (:mod:`.keyed_cache`, :mod:`.scan_cache`), version
order (:mod:`.versions`), plausibility findings (:mod:`.quality`) and the inventory of a root
(:mod:`.inventory`).

May import: numpy, pyarrow, yaml, packaging; modperf.base, modperf.fast, modperf.specs.
"""
