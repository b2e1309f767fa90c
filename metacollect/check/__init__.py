"""Tools that sit on a store: :mod:`~metacollect.check.validate` checks one against the
schema, :mod:`~metacollect.check.doctor` salvages a damaged one into a new store."""
