"""Where the upstream service is called: its API client (:mod:`.client`), its webhook
subscriptions (:mod:`.subscriptions`, ``receiver webhooks``) and the watchdog that checks them
(:mod:`.watchdog`)."""
