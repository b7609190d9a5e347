"""Stands in for vLLM's server under the launcher: prints the arguments it was given, as JSON."""

import json
import sys

print(json.dumps(sys.argv[1:]))
