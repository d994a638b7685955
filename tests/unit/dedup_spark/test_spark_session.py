"""The pure parts of Spark on Kubernetes: a client-mode driver's settings from its pod's
environment, and the executor command `dedup-entrypoint executor` runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from dedup_spark.entrypoint import (
    EXECUTOR_BACKEND,
    EntrypointError,
    driver_command,
    executor_command,
    java_options,
)
from dedup_spark.session import SessionError, SparkSettings, kafka_jars, kubernetes_conf
from dedup_spark.worker_daemon import short_path

POD_ENV = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "KUBERNETES_SERVICE_PORT": "443",
    "DEDUP_POD_IP": "10.1.2.3",
    "DEDUP_POD_NAME": "events-reconcile-29000000-abcde",
    "DEDUP_NAMESPACE": "streams",
}


def test_a_driver_pod_runs_in_client_mode_against_its_own_api_server() -> None:
    conf = kubernetes_conf(
        SparkSettings("k8s", image="reg/dedup-operator:1.0", executors=3), POD_ENV
    )
    assert conf["spark.master"] == "k8s://https://10.96.0.1:443"
    assert conf["spark.submit.deployMode"] == "client"
    assert conf["spark.driver.host"] == conf["spark.driver.bindAddress"] == "10.1.2.3"
    assert conf["spark.kubernetes.driver.pod.name"] == "events-reconcile-29000000-abcde"
    assert conf["spark.kubernetes.namespace"] == "streams"
    assert conf["spark.kubernetes.container.image"] == "reg/dedup-operator:1.0"
    assert conf["spark.executor.instances"] == "3"
    assert conf["spark.kubernetes.authenticate.oauthTokenFile"].endswith("serviceaccount/token")


def test_an_explicit_master_url_and_ipv6() -> None:
    env = {**POD_ENV, "KUBERNETES_SERVICE_HOST": "fd00::1"}
    assert kubernetes_conf(SparkSettings("k8s", image="i"), env)["spark.master"] == (
        "k8s://https://[fd00::1]:443"
    )
    conf = kubernetes_conf(SparkSettings("k8s://https://api:6443", image="i"), POD_ENV)
    assert conf["spark.master"] == "k8s://https://api:6443"


@pytest.mark.parametrize("dropped", ["DEDUP_POD_IP", "DEDUP_POD_NAME", "KUBERNETES_SERVICE_HOST"])
def test_a_driver_outside_a_pod_is_refused_with_what_is_missing(dropped: str) -> None:
    env = {k: v for k, v in POD_ENV.items() if k != dropped}
    with pytest.raises(SessionError, match=dropped):
        kubernetes_conf(SparkSettings("k8s", image="i"), env)


def test_executors_need_an_image() -> None:
    with pytest.raises(SessionError, match="--image"):
        kubernetes_conf(SparkSettings("k8s"), POD_ENV)


EXECUTOR_ENV = {
    "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@10.1.2.3:7078",
    "SPARK_EXECUTOR_ID": "2",
    "SPARK_EXECUTOR_CORES": "1",
    "SPARK_EXECUTOR_MEMORY": "512m",
    "SPARK_APPLICATION_ID": "spark-abc",
    "SPARK_EXECUTOR_POD_IP": "10.1.2.9",
    "SPARK_EXECUTOR_POD_NAME": "events-exec-2",
    "SPARK_RESOURCE_PROFILE_ID": "0",
    "SPARK_CONF_DIR": "/opt/spark/conf",
    "SPARK_JAVA_OPT_10": "-Dlast",
    "SPARK_JAVA_OPT_2": "-Dsecond",
    "SPARK_JAVA_OPT_0": "-Dfirst",
}


def test_the_executor_command_is_the_official_images() -> None:
    cmd = executor_command(EXECUTOR_ENV, Path("/venv/pyspark"), "/usr/bin/java")
    assert cmd[:6] == ["/usr/bin/java", "-Dfirst", "-Dsecond", "-Dlast", "-Xms512m", "-Xmx512m"]
    assert cmd[6:8] == ["-cp", "/opt/spark/conf:/venv/pyspark/jars/*"]
    assert cmd[8] == EXECUTOR_BACKEND
    flags = dict(zip(cmd[9::2], cmd[10::2], strict=True))
    assert flags == {
        "--driver-url": "spark://CoarseGrainedScheduler@10.1.2.3:7078",
        "--executor-id": "2",
        "--cores": "1",
        "--app-id": "spark-abc",
        "--hostname": "10.1.2.9",
        "--resourceProfileId": "0",
        "--podName": "events-exec-2",
    }


def test_java_options_in_numeric_order() -> None:
    assert java_options(EXECUTOR_ENV) == ["-Dfirst", "-Dsecond", "-Dlast"]


def test_an_incomplete_executor_environment_is_named() -> None:
    env = {k: v for k, v in EXECUTOR_ENV.items() if k != "SPARK_DRIVER_URL"}
    with pytest.raises(EntrypointError, match="SPARK_DRIVER_URL"):
        executor_command(env, Path("/x"), "java")


def test_python_workers_drop_the_zips_and_jars_only_when_pyspark_is_installed(
    tmp_path: Path,
) -> None:
    installed = tmp_path / "site-packages"
    (installed / "pyspark").mkdir(parents=True)
    (installed / "pyspark" / "daemon.py").touch()
    spark_path = ["/spark/python/lib/pyspark.zip", "/spark/jars/spark-core_2.13-4.0.0.jar"]
    assert short_path([*spark_path, str(installed)]) == [str(installed)]
    assert short_path([*spark_path, str(tmp_path)]) == [*spark_path, str(tmp_path)]


def test_the_driver_command_is_the_official_images_client_mode_submit() -> None:
    env = {"SPARK_DRIVER_BIND_ADDRESS": "10.1.2.3"}
    args = ["--properties-file", "/opt/spark/conf/spark.properties", "local:///app.py"]
    cmd = driver_command(env, Path("/venv/pyspark"), args)
    assert cmd == [
        "/venv/pyspark/bin/spark-submit",
        *("--conf", "spark.driver.bindAddress=10.1.2.3"),
        *("--conf", "spark.executorEnv.SPARK_DRIVER_POD_IP=10.1.2.3"),
        *("--deploy-mode", "client"),
        *args,
    ]


def test_a_cluster_mode_driver_pod_gets_the_images_kafka_jars_on_its_classpath() -> None:
    """Spark's cluster-mode pod args (DriverCommandFeatureStep) and env (BasicDriverFeatureStep
    and the image's DEDUP_SPARK_JARS): the args pass through unchanged after the driver's
    own settings; the Kafka jars go on the driver JVM's classpath (the job's session adds
    them to spark.jars only after that JVM is up)."""
    env = {
        "SPARK_DRIVER_BIND_ADDRESS": "10.1.2.3",
        "SPARK_APPLICATION_ID": "spark-0123",
        "SPARK_CONF_DIR": "/opt/spark/conf",
        "DEDUP_SPARK_JARS": "/opt/dedup/spark-jars",
    }
    args = [
        *("--properties-file", "/opt/spark/conf/spark.properties"),
        *("--class", "org.apache.spark.deploy.PythonRunner"),
        "local:///opt/dedup/reconcile.py",
        *("--master", "k8s"),
    ]
    cmd = driver_command(env, Path("/venv/pyspark"), args)
    assert cmd[-len(args) :] == args
    assert cmd[cmd.index("--deploy-mode") + 1] == "client"
    confs = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--conf"]
    assert "spark.driver.extraClassPath=/opt/dedup/spark-jars/*" in confs
    assert "spark.driver.bindAddress=10.1.2.3" in confs


def test_a_cluster_mode_driver_asks_its_own_api_server_for_executors() -> None:
    """A driver spark-submit started in cluster mode uses spark.kubernetes.driver.master
    (default https://kubernetes.default.svc) and the mounted account's settings."""
    conf = kubernetes_conf(SparkSettings("k8s", image="i"), POD_ENV)
    assert conf["spark.kubernetes.driver.master"] == "https://10.96.0.1:443"
    assert (
        conf["spark.kubernetes.authenticate.driver.mounted.oauthTokenFile"]
        == (conf["spark.kubernetes.authenticate.oauthTokenFile"])
    )
    assert conf["spark.kubernetes.authenticate.driver.mounted.caCertFile"].endswith("ca.crt")


def test_a_driver_without_its_bind_address_or_application_is_named() -> None:
    with pytest.raises(EntrypointError, match="SPARK_DRIVER_BIND_ADDRESS"):
        driver_command({}, Path("/x"), ["app.py"])
    with pytest.raises(EntrypointError, match="application"):
        driver_command({"SPARK_DRIVER_BIND_ADDRESS": "1.2.3.4"}, Path("/x"), [])


def test_a_master_that_would_send_the_token_in_clear_is_refused() -> None:
    """Issue 18: the token goes to whatever the master names; http would expose it."""
    for master in ("k8s://http://10.0.0.1:80", "k8s://10.0.0.1:6443"):
        with pytest.raises(SessionError, match=r"only k8s .* or k8s://https://"):
            kubernetes_conf(SparkSettings(master, image="img"), {})


def test_the_kafka_jars_come_only_from_the_directory_the_environment_names(
    tmp_path: Path,
) -> None:
    """The job never looks for the checkout's harness: the image sets DEDUP_SPARK_JARS,
    and in a checkout the harness does (dedup_local.spark.use_cached_kafka_jars)."""
    with pytest.raises(SessionError, match="DEDUP_SPARK_JARS is not set"):
        kafka_jars({})
    with pytest.raises(SessionError, match="holds no spark-sql-kafka jar"):
        kafka_jars({"DEDUP_SPARK_JARS": str(tmp_path)})
    for name in ("spark-sql-kafka-0-10_2.13-4.0.0.jar", "kafka-clients-3.9.0.jar"):
        (tmp_path / name).touch()
    assert [j.name for j in kafka_jars({"DEDUP_SPARK_JARS": str(tmp_path)})] == [
        "kafka-clients-3.9.0.jar",
        "spark-sql-kafka-0-10_2.13-4.0.0.jar",
    ]
