"""What the HTML reports share: the stylesheet of the sweep report (normlab_report.py) and of the
frontier report (normlab_frontier.py), one look for both. Standard library only.
"""

CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 24px auto;
       max-width: 1200px; color: #1d1d1f; line-height: 1.4; padding: 0 16px; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
.meta { color: #555; font-size: 0.9em; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f2f2f2; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.cell div + div { margin-top: 4px; border-top: 1px dotted #bbb; padding-top: 4px; }
.ok { background: #e6f4ea; } .bad { background: #fde7e7; } .fail { background: #eeeeee; }
.live { background: #fff6d6; } .none { background: #fafafa; color: #777; }
.status { font-weight: 600; } .small { font-size: 0.85em; color: #444; }
figure { margin: 12px 0 24px; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.9em; color: #333; max-width: 900px; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 12px; }
.paper { display: grid; grid-template-columns: minmax(0, 3fr) minmax(0, 2fr); gap: 16px; align-items: start; }
.paper-text { background: #f7f7fb; border: 1px solid #dde; padding: 8px 14px; font-size: 0.92em; }
.paper-text h3 { margin: 4px 0 8px; font-size: 1.05em; }
pre { background: #f6f8fa; padding: 12px; overflow-x: auto; font-size: 0.85em; }
"""
