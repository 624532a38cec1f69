"""The run explorer: a marimo notebook over the tool's MLflow tracking store.

Pick runs by the tags the MLflow UI shows; look at one quantized run layer by layer (its stored integer
weights, dequantized against the FP32 weights, per-channel scales and zero points, the share of weights on
the grid's ends or clipped, the layer's SQNR from the run's layer analysis), for the ONNX Runtime, PyTorch
and TFLite models alike; put two runs side by side (where they part, stage by stage as `python -m
resnet8ptq.diff`; per-class accuracy, confusion matrices, the test images one gets right and the other
wrong); and map a sweep's accuracy by bit widths and device settings, each cell linking to its run. It
reads what the runs logged and evaluates nothing itself.

    make explore              # marimo run on $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db
    marimo run explore/runs.py -- --tracking-uri postgresql://user@host/db [--experiment NAME] [--ui URL]
    marimo edit explore/runs.py -- --tracking-uri sqlite:///mlflow.db      # as an editable notebook

docs/explore.md says what each view reads.
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="full", app_title="resnet8ptq: runs")


@app.cell
def _():
    import os

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # as every process of the tool
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

    import marimo as mo
    import numpy as np
    import pandas as pd
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    import resnet8ptq.explore as ex  # reading the store (resnet8ptq/explore/)

    return ex, go, make_subplots, mo, np, pd


@app.cell
def _(ex, mo):
    args = mo.cli_args()
    uri = ex.tracking_uri(args)
    experiment = str(args.get("experiment") or ex.DEFAULT_EXPERIMENT)
    ui = ex.ui_base(uri, args.get("ui"))
    root = ex.data_root(args)
    return experiment, root, ui, uri


@app.cell
def _(ex, experiment, mo, uri):
    try:
        experiment_id, all_runs, sweeps = ex.experiment_runs(uri, experiment)
    except Exception as _error:  # no store, no experiment: say so instead of a traceback
        mo.stop(True, mo.callout(mo.md(f"**Cannot read the runs.** {_error}"), kind="danger"))
    table = ex.runs_table(all_runs, sweeps)
    mo.md(
        f"# resnet8ptq runs\n"
        f"Store `{uri}`, experiment **{experiment}** ({experiment_id}): {len(table)} runs in "
        f"{len(sweeps)} sweeps. Everything below is read from what the runs logged (tags, metrics, "
        f"artifacts, saved models); nothing is evaluated here."
    )
    return experiment_id, sweeps, table


@app.cell
def _(ex, mo, table):
    def _options(column):
        return sorted(table[column].dropna().astype(str).unique()) if column in table else []

    _params = mo.query_params()  # e.g. ?dtype=int8&backend=onnx&backend=torch preselects these
    filters = mo.ui.dictionary(
        {
            column: mo.ui.multiselect(
                options=_options(column),
                value=[v for v in _params.get_all(column) if v in _options(column)],
                label=label,
            )
            for column, label in {**ex.FILTERS, "kind": "kind"}.items()
        }
    )
    mo.hstack(list(filters.elements.values()), wrap=True, justify="start")
    return (filters,)


@app.cell
def _(ex, filters, mo, pd, table):
    shown = ex.filter_runs(table, filters.value).reset_index(drop=True)
    _defaults = ex.default_layer_runs(shown)
    runs_view = mo.ui.table(
        shown[ex.table_columns(shown)],
        initial_selection=[int(i) for i in shown.index[shown["run_id"].isin(_defaults)]],
        page_size=8,
        show_column_summaries=False,
        show_data_types=False,
        format_mapping={
            c: lambda v: "" if pd.isna(v) else f"{v:.2f}"
            for c in ("accuracy_pct", "delta_points", "accuracy_device_pct")
        },
        label="Runs (newest first; tick the runs the layer view shows, up to four)",
    )
    runs_view  # noqa: B018 (the cell's output)
    return runs_view, shown


@app.cell
def _(runs_view, shown):
    ticked = shown[shown["run_id"].isin(runs_view.value["run_id"])] if len(runs_view.value) else shown[:0]
    return (ticked,)


@app.cell
def _(ex, experiment_id, mo, ticked, uri):
    # The layer view's runs: the ticked quantized runs (published models too), up to four; each read once.
    layer_runs = ticked[ticked["kind"] != "fp32"].head(4)
    _own = layer_runs[layer_runs["kind"] == "quantized"]["run_id"]  # the .h5 they were made from
    _sha = ex.client_for(uri).get_run(_own.iloc[0]).data.tags.get("model.sha256") if len(_own) else None
    with mo.status.spinner(title="Reading the FP32 model and the runs' saved models ..."):
        fp32_path, fp32_source = ex.fp32_onnx(uri, experiment_id, _sha)
        fp32 = ex.fp32_layers(fp32_path) if fp32_path else []
        read = {run_id: ex.run_layers(uri, run_id, fp32_path) for run_id in layer_runs["run_id"]}
    _names = [layer.weight_name for layer in fp32]
    _labels = {layer.weight_name: layer.label for layer in fp32}
    for _run in read.values():
        _names += [name for name in _run.layers if name not in _names]
    _first = mo.query_params().get("layer") or (_names[0] if _names else None)  # ?layer=conv2d_7_1
    _first = _first if _first in _names else (_names[0] if _names else None)
    layer_pick = mo.ui.dropdown(
        options={_labels.get(name, name): name for name in _names},
        value=_labels.get(_first, _first) if _first else None,
        label="layer (FP32 weight name)",
    )
    return fp32_source, layer_pick, layer_runs, read


@app.cell
def _(layer_pick, mo, read):
    _channels = max(
        (len(r.layers[layer_pick.value].scale) for r in read.values() if layer_pick.value in r.layers),
        default=0,
    )
    channel_pick = mo.ui.dropdown(
        options={"all channels": -1, **{f"channel {c}": c for c in range(_channels)}},
        value="all channels",
        label="output channel",
    )
    return (channel_pick,)


@app.cell
def _(channel_pick, ex, fp32_source, go, layer_pick, layer_runs, make_subplots, mo, np, pd, read, uri):
    def _figure(layer, title):
        """Integer histogram | dequantized vs FP32 | per-channel scale and zero point."""
        figure = make_subplots(
            rows=1,
            cols=3,
            specs=[[{}, {}, {"secondary_y": True}]],
            subplot_titles=(
                f"stored integers (grid {layer.qmin}..{layer.qmax})",
                "dequantized (q - zp)·scale vs FP32",
                "per-channel scale and zero point",
            ),
            horizontal_spacing=0.07,
        )
        values, counts = np.unique(layer.integers, return_counts=True)
        figure.add_trace(go.Bar(x=values, y=counts, name="integers", marker_color="#4c72b0"), row=1, col=1)
        for end in (layer.qmin, layer.qmax):
            figure.add_vline(x=end, line_dash="dot", line_color="#c44e52", row=1, col=1)
        dequantized = layer.dequantized().ravel()
        reference = layer.fp32.ravel() if layer.fp32 is not None else np.empty(0, np.float32)
        values = np.concatenate([dequantized, reference])
        if len(np.unique(layer.scale)) == 1:  # one grid (one channel, or per tensor): bins on its steps
            step = float(layer.scale[0])
            step *= max(1, int(np.ceil((values.max() - values.min()) / step / 120)))
            low = (np.floor(values.min() / step) - 0.5) * step
            edges = np.arange(low, values.max() + step, step)
        else:
            edges = np.histogram_bin_edges(values, bins=90)
        centers = (edges[:-1] + edges[1:]) / 2
        figure.add_trace(
            go.Bar(
                x=centers, y=np.histogram(dequantized, edges)[0], name="dequantized", marker_color="#55a868"
            ),
            row=1,
            col=2,
        )
        if len(reference):
            figure.add_trace(
                go.Scatter(
                    x=centers,
                    y=np.histogram(reference, edges)[0],
                    name="FP32",
                    line={"shape": "hvh", "color": "black", "width": 1.5},
                ),
                row=1,
                col=2,
            )
        channels = np.arange(len(layer.scale)) if channel_pick.value < 0 else np.array([channel_pick.value])
        figure.add_trace(
            go.Bar(x=channels, y=layer.scale, name="scale", marker_color="#8172b2"), row=1, col=3
        )
        figure.add_trace(
            go.Scatter(
                x=channels, y=layer.zero_point, mode="markers", name="zero point", marker_color="#dd8452"
            ),
            row=1,
            col=3,
            secondary_y=True,
        )
        figure.update_layout(
            title={"text": title, "font": {"size": 14}},
            height=300,
            margin={"l": 40, "r": 20, "t": 60, "b": 30},
            barmode="overlay",
            legend={"orientation": "h", "y": -0.15},
        )
        return figure

    _rows, _figures, _notes, _problems = [], [], [], []
    for _run in layer_runs.itertuples():
        _read = read[_run.run_id]
        _title = f"{_run.run_name} ({_run.backend}, {_run.run_id[:8]})"
        if _read.error:
            _problems.append(f"**{_title}**: {_read.error}")
            continue
        if layer_pick.value not in _read.layers:
            _problems.append(f"**{_title}**: no layer {layer_pick.value} in its model")
            continue
        _layer = _read.layers[layer_pick.value].select(channel_pick.value)
        _sqnr = ex.layer_sqnr(ex.csv_artifact(uri, _run.run_id, "analysis/layer_sqnr.csv"), _layer)
        _ends, _clipped = _layer.on_grid_ends(), _layer.clipped()
        _rows.append(
            {
                "run": _title,
                "reader": _read.source,
                "name in its model": _layer.name,
                "FP32 matched by": _layer.matched_by,
                "channels": _layer.channels,
                "scale min..max": f"{_layer.scale.min():.3g}..{_layer.scale.max():.3g}",
                "zero points": ", ".join(str(z) for z in np.unique(_layer.zero_point)[:4]),
                "on grid ends %": None if _ends is None else round(100 * _ends, 3),
                "clipped %": None if _clipped is None else round(100 * _clipped, 3),
                "weight SQNR dB": None if _sqnr[0] is None else round(_sqnr[0], 2),
                "output SQNR dB": None if _sqnr[2] is None else f"{_sqnr[2]:.2f} ({_sqnr[1]})",
            }
        )
        _figures.append(mo.as_html(_figure(_layer, _title)))
        _notes += [f"{_title}: {note}" for note in _read.notes]
    _where = (
        "Each run's model is read into integer layers by its backend's reader (`Backend.integer_model`, as "
        "`device=integer` reads it). FP32 weights: the canonical FP32 ONNX model, "
        f"{fp32_source}. Layers are paired with it by name (ONNX Runtime and TFLite layers are named after "
        "their output tensor: the FP32 conv's output or its ReLU's; PyTorch nodes are mapped to the ONNX "
        "nodes they were exported from), and by weight values where no name matches (a published model). "
        "With `algo` steps the FP32 weights are those before the algorithm. Grid ends: the tool's integer "
        "range for the run's weight type and width (`resnet8ptq/dtype.py`). Clipped: FP32 weights whose "
        "nearest grid point lies beyond the ends. SQNR: the run's `analysis/layer_sqnr.csv`. "
        "docs/explore.md has the details."
    )
    layer_view = mo.vstack(
        [
            mo.hstack([layer_pick, channel_pick], justify="start"),
            mo.accordion({"Where this comes from": mo.md("\n\n".join([_where, *_notes]))})
            if layer_runs.size
            else mo.md("Tick one or more quantized runs in the table to see their layers."),
            mo.Html(pd.DataFrame(_rows).to_html(index=False, border=0, na_rep="—")) if _rows else mo.md(""),
            mo.callout(mo.md("\n\n".join(_problems)), kind="warn") if _problems else mo.md(""),
            *_figures,
        ]
    )
    return (layer_view,)


@app.cell
def _(mo, shown, ticked):
    _finished = shown[shown["status"] == "FINISHED"]
    _labels = {f"{r.run_name} [{r.run_id[:8]}]": r.run_id for r in _finished.itertuples()}
    _order = [*ticked["run_id"], *_finished["run_id"]]
    _first = list(dict.fromkeys(i for i in _order if i in set(_finished["run_id"])))[:2]
    _key = {v: k for k, v in _labels.items()}
    pick_a = mo.ui.dropdown(
        _labels, value=_key[_first[0]] if _first else None, label="run A", searchable=True
    )
    pick_b = mo.ui.dropdown(
        _labels, value=_key[_first[-1]] if _first else None, label="run B", searchable=True
    )
    source_pick = mo.ui.radio(
        {"reference (evaluation/)": "evaluation", "device (device/)": "device"},
        value="reference (evaluation/)",
        label="predictions",
        inline=True,
    )
    thumbs = mo.ui.slider(4, 32, step=4, value=8, label="thumbnails", show_value=True)
    return pick_a, pick_b, source_pick, thumbs


@app.cell
def _(ex, go, make_subplots, mo, np, pick_a, pick_b, root, source_pick, thumbs, uri):
    def _compare(a, b):
        client = ex.client_for(uri)
        run_a, run_b = client.get_run(a), client.get_run(b)
        name_a, name_b = f"A: {run_a.info.run_name}", f"B: {run_b.info.run_name}"
        parts = []
        accuracy = [r.data.metrics.get("accuracy") for r in (run_a, run_b)]
        if None not in accuracy:
            parts.append(
                mo.md(
                    f"Logged accuracy: **{name_a}** {100 * accuracy[0]:.2f} %, **{name_b}** "
                    f"{100 * accuracy[1]:.2f} % (B - A {100 * (accuracy[1] - accuracy[0]):+.2f} points)."
                )
            )
        where = ex.where_runs_part(uri, a, b)
        parted = where[where["difference"] != "same"]
        first = "no difference" if parted.empty else f"first difference: {parted.iloc[0].stage}"
        parts.append(
            mo.md(f"**Where the runs part** (as `python -m resnet8ptq.diff A B`, stage by stage): {first}.")
        )
        parts.append(mo.ui.table(where, selection=None, pagination=False, show_column_summaries=False))
        classes = [ex.class_accuracy(r.data.tags, r.data.metrics) for r in (run_a, run_b)]
        bars = go.Figure(
            [
                go.Bar(x=c.index, y=100 * c.to_numpy(), name=n)
                for c, n in zip(classes, (name_a, name_b), strict=True)
            ]
        )
        bars.update_layout(
            title="per-class accuracy (metrics class_acc/*), %", height=300, margin={"t": 40, "b": 30}
        )
        parts.append(mo.as_html(bars))
        matrices = [ex.confusion(uri, r) for r in (a, b)]
        if all(m is not None for m in matrices):
            figure = make_subplots(rows=1, cols=3, subplot_titles=(name_a, name_b, "B - A"))
            for col, values in enumerate([matrices[0], matrices[1], matrices[1] - matrices[0]], start=1):
                figure.add_trace(
                    go.Heatmap(
                        z=values.to_numpy(),
                        x=list(values.columns),
                        y=list(values.index),
                        text=values.to_numpy(),
                        texttemplate="%{text}",
                        colorscale="RdBu" if col == 3 else "Blues",
                        zmid=0 if col == 3 else None,
                        showscale=False,
                    ),
                    row=1,
                    col=col,
                )
            figure.update_yaxes(autorange="reversed")
            figure.update_yaxes(title_text="true class", col=1)
            figure.update_xaxes(title_text="predicted")
            figure.update_layout(
                title="confusion matrices (evaluation/confusion_matrix.csv)", height=420, margin={"t": 70}
            )
            parts.append(mo.as_html(figure))
        tables = [ex.predictions(uri, r, source_pick.value) for r in (a, b)]
        if any(t is None for t in tables):
            parts.append(
                mo.md(
                    f"No predicted classes in `{source_pick.value}/predictions.csv` of both runs (an AUC run "
                    "logs scores: see its `evaluation/roc_curve.png`)."
                )
            )
            return parts
        try:
            only_a, only_b = ex.disagreements(*tables)
        except ValueError as error:
            parts.append(mo.md(f"Images not compared: {error}."))
            return parts
        images, labels = None, None
        names = ex.class_names(run_a.data.tags, run_a.data.metrics)
        if run_a.data.tags.get("data", "cifar10") == "cifar10":  # thumbnails of CIFAR-10's test images
            try:
                images, labels = ex.test_set(root)
            except Exception as error:  # no CIFAR-10 here: the indices only
                parts.append(
                    mo.md(f"No thumbnails (CIFAR-10 not read from `{root}`: {error}); --data-root sets it.")
                )

        for title, indices in ((f"{name_a} right, B wrong", only_a), (f"{name_b} right, A wrong", only_b)):
            shown_ = indices[: thumbs.value]
            cards = []
            for index in shown_:
                row_a, row_b = tables[0].loc[index], tables[1].loc[index]
                caption = (
                    f"#{index} {names[row_a.label]}: A {names[row_a.predicted]}, B {names[row_b.predicted]}"
                )
                if images is not None and labels[index] == row_a.label:
                    cards.append(mo.image(ex.thumbnail(images[index]), caption=caption, width=96))
                else:
                    cards.append(mo.md(caption))
            parts.append(mo.md(f"**{title}: {len(indices)} test images** (the first {len(shown_)}):"))
            parts.append(mo.hstack(cards, wrap=True, justify="start"))
        return parts

    compare_view = mo.vstack(
        [
            mo.hstack([pick_a, pick_b, source_pick, thumbs], justify="start", wrap=True),
            *(
                _compare(pick_a.value, pick_b.value)
                if pick_a.value and pick_b.value
                else [mo.md("Choose two finished runs.")]
            ),
            mo.md(
                "The images come from the runs' logged predictions (`evaluation/predictions.csv`: every "
                "run's reference semantics; `device/predictions.csv`: a device run's). The runtime (native) "
                "form's per-image predictions are not logged: only its accuracy (`accuracy_native`)."
            ),
        ]
    )
    return (compare_view,)


@app.cell
def _(mo, sweeps):
    sweep_pick = mo.ui.dropdown(
        {f"{s.info.run_name} [{s.info.run_id[:8]}]": s.info.run_id for s in sweeps},
        value=f"{sweeps[0].info.run_name} [{sweeps[0].info.run_id[:8]}]" if sweeps else None,
        label="sweep",
        searchable=True,
    )
    return (sweep_pick,)


@app.cell
def _(ex, sweep_pick, uri):
    sweep_table = ex.runs_table(ex.sweep_runs(uri, sweep_pick.value)) if sweep_pick.value else None
    return (sweep_table,)


@app.cell
def _(ex, mo, sweep_table):
    from resnet8ptq.report.runs import DEVICE_SETTINGS

    _devices = sweep_table[sweep_table["device"].str.startswith("cim")] if sweep_table is not None else None
    device_axes = (
        ex.varying(_devices, [f"device_{s}" for s in DEVICE_SETTINGS]) if _devices is not None else []
    )
    axis_x = mo.ui.dropdown(device_axes, value=device_axes[0] if device_axes else None, label="columns")
    axis_y = mo.ui.dropdown(
        device_axes,
        value=device_axes[1] if len(device_axes) > 1 else None,
        label="rows",
        allow_select_none=True,
    )
    return axis_x, axis_y, device_axes


@app.cell
def _(axis_x, axis_y, device_axes, ex, experiment_id, mo, sweep_pick, sweep_table, ui):
    def _link(run_id):
        return ex.run_url(ui, experiment_id, run_id)

    _parts = [sweep_pick]
    if sweep_table is None or sweep_table.empty:
        _parts.append(mo.md("No sweep runs in this store."))
    else:
        _own = sweep_table[sweep_table["kind"] == "quantized"]
        _group = ex.varying(_own, ex.BITS_GROUP)
        _bits = ex.accuracy_maps(_own, "weight_bits", "activation_bits", "accuracy", _group)
        _parts.append(
            mo.md(
                "### Accuracy (%) by weight × activation bits\n"
                + (f"One map per {', '.join(_group)}. " if _group else "")
                + f"The same in all: {ex.fixed(_own, ex.BITS_GROUP) or 'nothing'}. Each cell links to its "
                f"run in the MLflow UI ({ui}); device runs of one quantization share its accuracy."
            )
        )
        _parts.append(mo.hstack([mo.Html(ex.map_html(m, _link)) for m in _bits], wrap=True, justify="start"))
        _parts.append(mo.md("### Accuracy on the device (%) by device settings"))
        if not device_axes:
            _parts.append(mo.md("No crossbar (`device=cim`) setting varies in this sweep."))
        else:
            _cim = sweep_table[sweep_table["device"].str.startswith("cim")].copy()
            _rows = axis_y.value or "backend"
            _others = ex.QUANTIZATION_GROUP + [c for c in device_axes if c not in (axis_x.value, _rows)]
            _maps = ex.accuracy_maps(_cim, _rows, axis_x.value, "accuracy_device", ex.varying(_cim, _others))
            _parts.append(mo.hstack([axis_x, axis_y], justify="start"))
            _parts.append(mo.md(f"The same in all: {ex.fixed(_cim, _others) or 'nothing'}."))
            _parts.append(
                mo.hstack([mo.Html(ex.map_html(m, _link)) for m in _maps], wrap=True, justify="start")
            )
    sweep_view = mo.vstack(_parts)
    return (sweep_view,)


@app.cell
def _(ex, go, make_subplots, mo, sweep_table):
    def _chips():
        if sweep_table is None or sweep_table.empty or sweep_table["device_energy_uj"].isna().all():
            return mo.md("No device run of this sweep had its chip costed (`components`, docs/chip_cost.md).")
        _figure = make_subplots(rows=1, cols=len(ex.CHIP_COSTS), subplot_titles=list(ex.CHIP_COSTS.values()))
        for _col, _cost in enumerate(ex.CHIP_COSTS, start=1):
            _chip = ex.chip_frontier(sweep_table, _cost)
            _front = _chip[_chip["on_front"]]
            _figure.add_trace(
                go.Scatter(
                    x=_chip[_cost], y=_chip["accuracy_device_pct"], mode="markers", text=_chip["run_name"],
                    hovertemplate="%{text}<br>%{x:.3g}, %{y:.2f} %<extra></extra>", showlegend=False,
                ),
                row=1, col=_col,
            )  # fmt: skip
            _figure.add_trace(
                go.Scatter(
                    x=_front[_cost], y=_front["accuracy_device_pct"], mode="lines+markers",
                    marker={"size": 14, "symbol": "circle-open", "color": "red"}, line={"dash": "dash"},
                    name="Pareto front", text=_front["run_name"], showlegend=_col == 1,
                    hovertemplate="%{text}<br>%{x:.3g}, %{y:.2f} %<extra></extra>",
                ),
                row=1, col=_col,
            )  # fmt: skip
            _figure.update_xaxes(title_text=ex.CHIP_COSTS[_cost], row=1, col=_col)
        _figure.update_yaxes(title_text="accuracy on the device (%)", row=1, col=1)
        _figure.update_layout(height=420, margin={"t": 40})
        return mo.vstack(
            [mo.md("### The chip: accuracy against its cost (the Pareto front ringed)"), _figure]
        )

    chip_view = _chips()
    return (chip_view,)


@app.cell
def _(chip_view, compare_view, layer_view, mo, sweep_view):
    mo.ui.tabs(
        {"Layers": layer_view, "Two runs": compare_view, "Sweep maps": mo.vstack([sweep_view, chip_view])}
    )
    return


if __name__ == "__main__":
    app.run()
