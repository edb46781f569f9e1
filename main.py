"""Entry point: compose the Hydra config -> typed config -> validate -> run -> teardown.

    python main.py                                  # the embedded default, on CPU
    python main.py model=qwen3_4b cluster=one_node_8gpu recipe=qwen3_4b_grpo
    python main.py --cfg job                        # print the composed config

Exit status: 0 completed, 2 configuration error (nothing was started), other non-zero: the run failed
(result.json in the run directory names the phase).
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from slime.driver.front_door import check_command_line
from slime.driver.launch import EXIT_CONFIG_ERROR, execute
from slime.plan.listing import register_listing_resolver
from slime.run_schema import register_configs

register_configs()
register_listing_resolver()  # ${slime_registry:} in the --help text


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(dcfg: DictConfig) -> float | None:
    return execute(dcfg)


if __name__ == "__main__":
    try:
        # Configuration errors and a dry run end here, before Hydra's job makes a run directory.
        check_command_line(
            sys.argv[1:], config_dir=Path(__file__).resolve().parent / "conf", config_name="config", job_name="main"
        )
        main()
    except KeyboardInterrupt as exc:  # a run's RunInterrupted carries 130 or 143; before the run: plain Ctrl-C
        sys.exit(getattr(exc, "exit_code", 130))
    except SystemExit as exc:
        # Hydra reports compose-time errors (misspelled key, bad type, unknown option) with status 1;
        # `execute` never exits with 1, so 1 can only mean a configuration error.
        sys.exit(EXIT_CONFIG_ERROR if exc.code == 1 else exc.code)
