"""``pipeline console``: the operator console in the browser.

One aiohttp process that reads Kafka (audit, DLQ, commands, the group's
offsets) and the workers' HTTP endpoints, and keeps nothing of its own but
its sessions and the redrives it ran since it started. HTML is rendered on
the server (Jinja2, every value escaped); ``static/`` holds its small
script and style sheet, shipped inside the wheel. See ``docs/console.md``.
"""
