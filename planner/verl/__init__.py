"""verl: its config keys and version, composing and checking its Hydra config, reading launch
scripts and jobs, exporting layouts as jobs, the configs library.  Imports ``plan`` and below."""
