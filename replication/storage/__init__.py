"""An instance's storage root: where each table and control file lives (``layout``) and the typed
control files that instances exchange (``control``)."""
