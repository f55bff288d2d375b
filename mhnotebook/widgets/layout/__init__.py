"""The layout visualizer: which device and host holds which block of an array.

Model to picture in pure steps, one file each, each testable without a widget
(each imports only those before it):

* `grid`: `layout_grid`, the blocks visible in one 2-D view, and `block_label`;
* `facets`: `layout_facets`, small multiples over the non-displayed axes;
* `replicas`: `replica_matrix`, replicated blocks x the devices holding them;
* `mesh`: `mesh_axes_info` and `mesh_html`, the mesh's axes and devices;
* `png`: `render_layout_png`, the picture (matplotlib Agg);
* `html_parts`: header, legend, a block's shards, the blocks as static HTML;
* `view`: `LayoutView`, the ipywidgets view; `tree`: `TreeLayoutView`, a pytree's.
"""
