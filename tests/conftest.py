"""Settings shared by the whole suite.

Hypothesis's default deadline (200 ms an example) measures the machine, not the
code: on a machine whose cores are busy with other jobs an example of the
pacer's property tests took longer and the run failed. The properties here are
about values, never about time, so no example has a deadline."""

from hypothesis import settings

settings.register_profile("dlcp", deadline=None)
settings.load_profile("dlcp")
