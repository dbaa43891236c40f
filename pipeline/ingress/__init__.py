"""The HTTP ingress: verify a webhook, key it, produce it, answer 2xx only after the broker's ack."""
