"""Importers that turn published profiling data into :class:`~scepsy_profile.Measurement` s."""

from scepsy_profile.importers.muxserve import load_muxserve_grid

__all__ = ["load_muxserve_grid"]
