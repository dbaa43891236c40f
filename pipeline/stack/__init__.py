"""`pipeline up`: the whole pipeline on one machine (a local broker, topics, ingress, worker, console)."""
