"""The wire log, its format in one place: what a record is (schema), how it is written
(writer: `WireLog`, and the run event's account of its workload) and how it is read back
(logread: the one reader, strict or lenient, and the follower of a log being written). Below
the recorder that writes it and everything that reads it; imports the protocol and the engine.
"""
