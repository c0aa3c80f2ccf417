"""What the tests share: stand-ins, fixtures and helpers. No test module imports another."""
