"""The ports actors depend on: small interfaces to other actors, reached over the bus."""
