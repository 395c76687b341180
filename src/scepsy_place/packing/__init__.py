"""Packing: the cluster and the placers that put replicas on its GPUs (docs/placement.md).

* :mod:`scepsy_place.packing.topology`: racks, nodes, NVLink domains, GPUs in use;
* :mod:`scepsy_place.packing.replicas`: replicas to place (``Demand``) and where they run (``Slot``);
* :mod:`scepsy_place.packing.placement`: the placers and their registry (``PLACERS``);
* :mod:`scepsy_place.packing.bounds`: lower bounds on the GPUs and nodes demands need;
* :mod:`scepsy_place.packing.quality`: a placement against its bounds;
* :mod:`scepsy_place.packing.fgd`: FGD's fragmentation measure;
* :mod:`scepsy_place.packing.check`: every placement invariant as a check;
* :mod:`scepsy_place.packing.groups`: replica groups on GPUs of their own;
* :mod:`scepsy_place.packing.improve`: the improvement phase (local search);
* :mod:`scepsy_place.packing.exact`: the exact placement test;
* :mod:`scepsy_place.packing.exhaustive`: the exhaustive placeable optimum of tiny instances;
* :mod:`scepsy_place.packing.openb`: online replay of the Alibaba GPU-sharing trace.
"""
