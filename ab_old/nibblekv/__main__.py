import sys

from nibblekv.cli import main

sys.exit(main())
