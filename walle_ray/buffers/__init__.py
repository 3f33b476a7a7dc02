"""Memory roles: replay shards, IMPALA's mixed memory, recorded datasets (``buffers/mixed.py``,
``replay.py``, ``dataset.py``); ``fifo.py`` is the queue inside the mixed memory."""
