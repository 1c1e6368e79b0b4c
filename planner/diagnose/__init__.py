"""Commands that judge a job or a plan: validate, fix, diff, explain, profile.  They return
data and render text; they may import ``report``, ``verl``, ``plan`` and below, never ``cli``."""
