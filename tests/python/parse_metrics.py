"""Parses Prometheus text exposition from stdin with prometheus_client's parser.

Prints {"families": {name: type}, "samples": {"name{label=value,...}": value}} as JSON;
fails (non-zero exit) when the text does not parse.
"""

import json
import sys

from prometheus_client.parser import text_string_to_metric_families

families, samples = {}, {}
for family in text_string_to_metric_families(sys.stdin.read()):
    families[family.name] = family.type
    for s in family.samples:
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
print(json.dumps({"families": families, "samples": samples}))
