"""`dedup-entrypoint`: the image's entrypoint, as the official Spark image's is.

`dedup-entrypoint driver <spark-submit args>` starts a Spark driver the way that script
does for the driver pod of cluster mode: pyspark's own `spark-submit` in client mode,
bound to the pod's address (`SPARK_DRIVER_BIND_ADDRESS`), with one addition: the image's
Kafka connector jars (`DEDUP_SPARK_JARS`) on the driver JVM's classpath, which this
spark-submit starts before the job's session can add them. The arguments Spark's cluster
mode gives the pod pass through unchanged.

`dedup-entrypoint executor` starts a Spark executor the way Spark's
`kubernetes/dockerfiles/spark/entrypoint.sh` does for the pods a Kubernetes driver
creates (`KubernetesExecutorBackend` from the `SPARK_*` environment), with the jars of
the pip-installed pyspark and this interpreter for the executor's Python workers.
Anything else is run as given (the official image's pass-through), so `dedup-entrypoint
dedup-worker ...` works too.

The exact commands, and what each argument is: docs/audit.md, "The image's entrypoint".
Exit codes: the driver's, executor's or command's own; 2 if the environment is
incomplete (one line says what is missing).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from dedup_spark.session import JARS_ENV, writable_cwd

log = logging.getLogger("dedup_spark.entrypoint")

EXECUTOR_BACKEND: Final = "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"
REQUIRED: Final = (
    "SPARK_DRIVER_URL",
    "SPARK_EXECUTOR_ID",
    "SPARK_EXECUTOR_CORES",
    "SPARK_APPLICATION_ID",
    "SPARK_EXECUTOR_POD_IP",
    "SPARK_EXECUTOR_MEMORY",
)
EXIT_CONFIG: Final = 2


class EntrypointError(Exception):
    pass


def spark_home() -> Path:
    """The pip-installed pyspark's directory: its `jars/` is a Spark distribution's."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise EntrypointError("pyspark is not installed in this environment")
    return Path(spec.origin).parent


def java_options(env: Mapping[str, str]) -> list[str]:
    """`SPARK_JAVA_OPT_<n>` values in the order of n (as `sort -t_ -k4 -n` does)."""
    found: list[tuple[int, str]] = []
    for name, value in env.items():
        if name.startswith("SPARK_JAVA_OPT_"):
            suffix = name.removeprefix("SPARK_JAVA_OPT_")
            found.append((int(suffix) if suffix.isdigit() else sys.maxsize, value))
    return [value for _, value in sorted(found)]


def executor_command(env: Mapping[str, str], home: Path, java: str) -> list[str]:
    """The executor's command line from its pod environment (pure)."""
    missing = [name for name in REQUIRED if not env.get(name)]
    if missing:
        raise EntrypointError(f"executor environment lacks {', '.join(missing)}")
    classpath = [f"{home / 'jars'}/*"]
    if env.get("SPARK_EXTRA_CLASSPATH"):
        classpath.append(env["SPARK_EXTRA_CLASSPATH"])
    if env.get("SPARK_CONF_DIR"):
        classpath.insert(0, env["SPARK_CONF_DIR"])
    host = env["SPARK_EXECUTOR_POD_IP"]
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6
    memory = env["SPARK_EXECUTOR_MEMORY"]
    return [
        java,
        *java_options(env),
        f"-Xms{memory}",
        f"-Xmx{memory}",
        "-cp",
        ":".join(classpath),
        EXECUTOR_BACKEND,
        *("--driver-url", env["SPARK_DRIVER_URL"]),
        *("--executor-id", env["SPARK_EXECUTOR_ID"]),
        *("--cores", env["SPARK_EXECUTOR_CORES"]),
        *("--app-id", env["SPARK_APPLICATION_ID"]),
        *("--hostname", host),
        *("--resourceProfileId", env.get("SPARK_RESOURCE_PROFILE_ID", "0")),
        *("--podName", env.get("SPARK_EXECUTOR_POD_NAME", "")),
    ]


def driver_command(env: Mapping[str, str], home: Path, args: Sequence[str]) -> list[str]:
    """The driver's command line from its pod environment and arguments (pure)."""
    bind = env.get("SPARK_DRIVER_BIND_ADDRESS")
    if not bind:
        raise EntrypointError("driver environment lacks SPARK_DRIVER_BIND_ADDRESS")
    if not args:
        raise EntrypointError("driver needs spark-submit arguments (an application)")
    extra: list[str] = []
    if env.get(JARS_ENV):
        # The image's Kafka connector jars on the driver JVM's classpath: this JVM is
        # started here, before the job's session adds them to spark.jars (which only
        # ships them to the executors), so Spark's `kafka` source would not be found.
        extra += ["--conf", f"spark.driver.extraClassPath={env[JARS_ENV]}/*"]
    return [
        str(home / "bin" / "spark-submit"),
        *("--conf", f"spark.driver.bindAddress={bind}"),
        *("--conf", f"spark.executorEnv.SPARK_DRIVER_POD_IP={bind}"),
        *extra,
        *("--deploy-mode", "client"),
        *args,
    ]


def find_java(env: Mapping[str, str]) -> str:
    if env.get("JAVA_HOME"):
        candidate = Path(env["JAVA_HOME"]) / "bin" / "java"
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("java", path=env.get("PATH"))
    if found is None:
        raise EntrypointError("no java on PATH and no JAVA_HOME")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not args:
        print(
            "usage: dedup-entrypoint driver <spark-submit args> | executor | <command> [args...]",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    if args[0] == "driver":
        return _driver(args[1:])
    if args[0] != "executor":
        program = shutil.which(args[0]) or args[0]
        try:
            os.execvp(program, args)
        except OSError as exc:
            log.error("cannot run %s: %s", args[0], exc.strerror)
            return 127
    env = dict(os.environ)
    try:
        home = spark_home()
        command = executor_command(env, home, find_java(env))
    except EntrypointError as exc:
        log.error("cannot start the executor: %s", exc)
        return EXIT_CONFIG
    env.setdefault("SPARK_HOME", str(home))
    # The executor's Python workers run this interpreter (the project's environment).
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    log.info("starting executor %s of %s", env["SPARK_EXECUTOR_ID"], env["SPARK_APPLICATION_ID"])
    os.execvpe(command[0], command, env)


def _driver(args: Sequence[str]) -> int:
    env = dict(os.environ)
    try:
        home = spark_home()
        command = driver_command(env, home, args)
        env.setdefault("JAVA_HOME", str(Path(find_java(env)).resolve().parents[1]))
    except EntrypointError as exc:
        log.error("cannot start the driver: %s", exc)
        return EXIT_CONFIG
    env.setdefault("SPARK_HOME", str(home))
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    writable_cwd()  # spark-submit's session writes under its current directory
    log.info("starting the driver: spark-submit %s", " ".join(args))
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    sys.exit(main())
