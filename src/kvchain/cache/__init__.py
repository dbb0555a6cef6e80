"""The prefix cache: content keys per page and (to come) the radix tree over the chain's
pages of every lifetime class, with its evictable supply priced by the planner."""
