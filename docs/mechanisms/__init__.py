"""The mechanism notes (NN-slug.md), installed as package data: `inferris-dist mechs NAME` prints one."""
