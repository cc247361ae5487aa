"""Operations: trust modes, drain, metrics, doctor, key rotation, embedded servers, the Sentinel group, fuzzing."""
