#!/usr/bin/python3
"""Scrapes a dsgd driver's metrics endpoint during a job as Prometheus would, parsing it with
prometheus_client's parser (Debian's python3-prometheus-client): waits until the driver counts
steps, has STANDBYS standbys ready and every member's step time has come with its heartbeat, then
prints every sample as one JSON object.

  /usr/bin/python3 tests/tools/scrape_metrics.py http://127.0.0.1:9400/metrics TIMEOUT_S STANDBYS
"""
import json
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(url):
    text = urllib.request.urlopen(url, timeout=2).read().decode()
    return list(text_string_to_metric_families(text))  # raises ValueError on a malformed exposition


def value(families, name):
    return next((s.value for f in families for s in f.samples if s.name == name), None)


def members_timed(families):
    times = [s.value for f in families for s in f.samples
             if s.name == "dsgd_worker_step_seconds" and s.labels.get("role") == "member"]
    return bool(times) and all(t > 0 for t in times)


def main():
    url, timeout, standbys = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    deadline, families, error = time.time() + timeout, [], "nothing answered"
    while True:
        try:
            families = scrape(url)
            if ((value(families, "dsgd_steps_total") or 0) > 0 and (value(families, "dsgd_standbys") or 0) >= standbys
                    and members_timed(families)):
                break
            error = "no steps counted, fewer standbys than %d, or a member's step time unknown" % standbys
        except (OSError, ValueError) as e:
            error = str(e)
        if time.time() > deadline:
            sys.exit("scrape_metrics: %s within %.0f s: %s" % (url, timeout, error))
        time.sleep(0.2)
    print(json.dumps({"types": {f.name: f.type for f in families},
                      "samples": [{"name": s.name, "labels": s.labels, "value": s.value}
                                  for f in families for s in f.samples]}))


if __name__ == "__main__":
    main()
