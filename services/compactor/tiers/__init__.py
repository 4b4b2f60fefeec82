"""The iteration log's tiers (seed 003) where the blob store holds them.

    hot ring      the last N iterations with full detail: database rows only (repository)
    warm chain    every iteration's hash-chained summary line: the active segment in the
                  database, sealed segments and their index file in the blob store (warm)
    cold archive  gzip snapshots of every K-th iteration's detail in the blob store (cold)

Every blob is a put-if-absent of bytes that are a pure function of content, so a step redone
after a crash writes exactly what the interrupted one would have (steps).
"""
