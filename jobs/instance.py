"""spark-submit entry point: run the instances named by the config files given as arguments.

    spark-submit jobs/instance.py conf/amps-1.xml [conf/amps-2.xml ...]
"""

import sys

from replication.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
