"""spark-submit entry point of the local demo: embedded broker, instances from conf/, a publisher."""

import sys

from replication.cli import main

if __name__ == "__main__":
    sys.exit(main(["demo", *sys.argv[1:]]))
