"""spark-submit entry point: bootstrap an instance from another (its <Bootstrap>), then exit.

    ./spark-submit.sh --bootstrap conf/amps-3.xml [--from ADDRESS]
"""

import signal
import sys

from replication.cli import main

if __name__ == "__main__":
    # spark-submit.sh starts the JVM with SIGTERM ignored (so instances stop their queries first); a
    # bootstrap has no queries to stop and resumes where it was cut, so SIGTERM simply ends it.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.exit(main(["bootstrap", *sys.argv[1:]]))
