"""What crossed the boundary, recorded: per-step records and the wire log (records), the Chrome
trace (timeline), and the numbers a serving engineer reads (metrics). Used by the scheduler
while it runs and by the command line after; imports the protocol and the engine only.
"""
