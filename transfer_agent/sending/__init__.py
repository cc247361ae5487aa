"""The sending side: a transfer's files, its tuner and its channel pool (cc channels x p streams, pp files ahead)."""
