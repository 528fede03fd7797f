"""The control plane's side of the boundary: the channel (the socket and who is rank R on it)
and its gate, admission, the two ways of getting members, the process group (the engine's
executor seam on N processes), the recovery policies, and the launch entry.
"""
