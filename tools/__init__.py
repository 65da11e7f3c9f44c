"""Development tools run from a clone (``make setup``, the image build); not part of the wheel."""
