"""A fleet of boxes behind one nginx: the router's configuration, the fleet key and its
tokens, and what a box asks of its peers (README "A fleet behind nginx")."""
