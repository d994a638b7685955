"""The peer of bench/worker_throughput.py: keyed deduplication in Quix Streams with its
RocksDB state and exactly-once processing. Runs in its own virtual environment (Quix's
pins conflict with ours); prints one JSON line with its timing.

    quix_dedup.py BOOTSTRAP INPUT_TOPIC OUTPUT_TOPIC RECORDS OUTPUTS STATE_DIR

Quix's `run(count=N)` stops after N *outputs*, so the caller passes how many distinct
ids the input holds; the run fails loudly if that is not reached within the timeout.
"""

import json
import sys
import time

from quixstreams import Application
from quixstreams.state import State

TIMEOUT_S = 900.0


def main() -> None:
    bootstrap, input_topic, output_topic, records, outputs, state_dir = sys.argv[1:7]
    app = Application(
        broker_address=bootstrap,
        consumer_group=f"quix-{input_topic}",
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        state_dir=state_dir,
        use_changelog_topics=True,
        loglevel="WARNING",
        auto_create_topics=True,
    )
    source = app.topic(input_topic, value_deserializer="json", key_deserializer="string")
    sink = app.topic(output_topic, value_serializer="json", key_serializer="string")

    def first_time(value: dict, state: State) -> bool:  # keyed by message id
        if state.get("seen", False):
            return False
        state.set("seen", True)
        return True

    sdf = app.dataframe(source)
    sdf = sdf.filter(first_time, stateful=True)
    sdf.to_topic(sink)
    started = time.monotonic()
    app.run(count=int(outputs), timeout=TIMEOUT_S, collect=False)
    seconds = time.monotonic() - started
    if seconds >= TIMEOUT_S - 1:
        sys.exit(f"peer did not publish {outputs} records within {TIMEOUT_S} s")
    print(json.dumps({"seconds": seconds, "records": int(records)}))


if __name__ == "__main__":
    main()
