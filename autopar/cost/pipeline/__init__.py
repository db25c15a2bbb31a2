"""Pipeline timing: the order torch runs each rank's actions in (:mod:`.orders`), the chunks held
at a rank's peak (:mod:`.held`), timed replays of the orders (:mod:`.replay`, :mod:`.timed_orders`),
the step time of a schedule (:mod:`.schedule`) and the per-rank timing of a config
(:mod:`.timing`)."""
