"""The control plane's side of the boundary: the channel (who is rank R, and the rounds with
them) over its transport (the socket) and gate, the faults' layers around them, admission, the
two ways of getting members, the process group (the engine's executor seam on N processes), the
recovery policies, and the launch entry.
"""
