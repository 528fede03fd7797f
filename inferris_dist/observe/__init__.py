"""What crossed the boundary, recorded: per-step records and the wire log (records), the wire
log's schema (schema) and its one reader (logread), the Chrome trace (timeline), the numbers a
serving engineer reads (metrics), the offline page of a wire log (page), a recorded run judged
afterwards from its wire log (check), and how a run is said in text (words). Used by the
scheduler while it runs and by the command line after; imports the protocol and the engine only.
"""
