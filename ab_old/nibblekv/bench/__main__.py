"""``python -m nibblekv.bench serve ...``: the benchmark client without importing torch."""

import sys

from nibblekv.bench.cli import main

sys.exit(main())
