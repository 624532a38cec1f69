"""Entry point: `python run.py [overrides]` runs one configuration, `python run.py -m ...` sweeps."""

import atexit
import os
import sys

_succeeded = False


def _leave_without_teardown() -> None:
    """The last exit step of an invocation that succeeded: after Python has stopped its threads (launchers'
    worker pools) and run every other exit hook (MLflow's, the sweep callback's), leave without its teardown
    of every loaded module, which with torch and inductor loaded took 3-5 s and writes nothing."""
    if _succeeded:
        import logging

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


# Registered before any library registers its own hooks: exit hooks run last-registered first, so this one
# runs after all of them. Hence the imports below this line.
atexit.register(_leave_without_teardown)

if __name__ == "__main__":  # not when a worker process (charts, launchers) imports this file as __mp_main__
    import logging

    import hydra
    from omegaconf import DictConfig

    import resnet8ptq.config  # noqa: F401  (registers the typed schema `base_config` and the group schemas)
    from resnet8ptq.app import task

    @hydra.main(config_path="conf", config_name="config", version_base="1.3")
    def main(cfg: DictConfig) -> float:
        return task(cfg)

    # A log record that cannot be written (e.g. the job's log file on a full disk) is dropped instead of
    # printing a traceback beside the run's own one-line error (Python's advice for production use).
    logging.raiseExceptions = False
    main()  # a failure raises SystemExit: the normal exit
    _succeeded = True
