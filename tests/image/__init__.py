"""The container image, built and run for real (``make image-test``; not part of ``make test``).

``python -m tests.image --image NAME`` starts the receiver from the image with buildah, feeds it
signed webhooks from the simulator on the host and checks what a deployment relies on: on SQLite
(one container, a data volume) and on Postgres (two containers on one inbox, one stopped mid-run).
"""
