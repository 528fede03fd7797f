"""The tests of inferris-dist: a package, so that they import their helpers as `tests.helpers`."""
