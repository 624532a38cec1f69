"""MLflow tracking: the store (:mod:`.store`), what identifies a result (:mod:`.identity`), the sweep run
(:mod:`.sweep`), its child runs (:mod:`.runs`), runs left by killed processes (:mod:`.stale`)."""
