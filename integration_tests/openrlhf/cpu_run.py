"""Driver of one OpenRLHF run on CPU under the jigsaw override (integration tests).

``python cpu_run.py <openrlhf args> --jigsaw.enable ...``: starts (or joins, with
``RAY_ADDRESS``) Ray with logical GPU slots for OpenRLHF's engine placement group, installs
the CPU stand-ins of ``cpu_standins.py`` (DeepSpeed model actors only), then hands the
command line to the adapter's real entry point, which runs OpenRLHF's unmodified
``openrlhf.cli.train_ppo_ray`` with runpy.
"""

import os
import sys
import time

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ray

    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    if os.environ.get("RAY_ADDRESS"):
        # this job's workers run this Python (the cluster may have been started from another
        # venv, e.g. verl's, whose workers have no OpenRLHF)
        ray.init(address=os.environ["RAY_ADDRESS"], runtime_env={"env_vars": env, "py_executable": sys.executable})
    else:
        # CPU stand-in: logical GPUs so OpenRLHF's {"GPU": 1, "CPU": 1} engine bundles schedule.
        ray.init(num_cpus=int(os.environ.get("JIGSAW_TEST_RAY_CPUS", "6")),
                 num_gpus=int(os.environ.get("JIGSAW_TEST_RAY_GPUS", "2")),
                 object_store_memory=300 * 1024 * 1024, runtime_env={"env_vars": env})
    from cpu_standins import install_cpu_standins

    install_cpu_standins()
    from jigsaw_plugin.adapters.openrlhf.train_ppo_ray import main

    rc = main(sys.argv[1:])
    time.sleep(2)  # let the actors' last log lines reach this driver before Ray goes
    ray.shutdown()
    sys.exit(rc)
