"""Calibrated UVM cost profiles (JSON data files, one per GPU / driver generation); see uvmlab.sim.uvm.profile."""
