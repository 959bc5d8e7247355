"""spark-submit entry point: bootstrap an instance from another (its <Bootstrap>), then exit.

    ./spark-submit.sh --bootstrap conf/amps-3.xml [--from ADDRESS]
"""

import sys

from replication.cli import main

if __name__ == "__main__":
    sys.exit(main(["bootstrap", *sys.argv[1:]]))
