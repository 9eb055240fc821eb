"""The page around the SVG: its style, its script and the node data, all inline."""
from __future__ import annotations

import html
import json
from typing import Any

STYLE = """
*{box-sizing:border-box}
body{margin:0;font:13px/1.4 'DejaVu Sans',Verdana,sans-serif;color:#1b2330;background:#f7f8fa;
display:flex;height:100vh;overflow:hidden}
#canvas{flex:1 1 auto;overflow:auto;min-width:0}
#panel{flex:0 0 460px;overflow:auto;border-left:1px solid #bec7d3;background:#fff;padding:12px 14px}
#panel h2{font-size:16px;margin:0 0 4px}#panel h3{font-size:13px;margin:14px 0 4px;color:#334}
.muted{color:#5c6776}.pass{color:#22864a;font-weight:bold}.fail{color:#c62828;font-weight:bold}
table{border-collapse:collapse;width:100%;margin:2px 0}td,th{border:1px solid #e1e5eb;
padding:2px 4px;text-align:left;vertical-align:top;font-size:12px}th{background:#eef2f7}
code{font-size:11px;word-break:break-all}
g.node{cursor:pointer}g.node:hover>rect:last-of-type{stroke-width:3.5}
g.node.selected>rect:last-of-type{stroke:#111;stroke-width:3.5}
g.node.failed>rect:last-of-type{stroke:#c62828;stroke-width:3;stroke-dasharray:6 3}
g.edge.dim,g.node.dim,g.terminal.dim{opacity:.25}
#tip{position:fixed;pointer-events:none;background:#1b2330;color:#fff;padding:3px 6px;
border-radius:4px;font-size:12px;display:none;white-space:pre}
button{font:inherit;padding:2px 8px;margin:6px 0}
#ops-filter{width:100%;margin:4px 0}
li.warning{white-space:pre-wrap;font-size:12px;margin-bottom:4px}
details>summary{cursor:pointer}
"""

SCRIPT = r"""
(function(){
var DATA=JSON.parse(document.getElementById('leapp-data').textContent);
var panel=document.getElementById('panel'),tip=document.getElementById('tip');
function esc(v){return String(v).replace(/[&<>"]/g,function(c){return{'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c];});}
function fmt(v){if(v===null||v===undefined)return'';if(typeof v==='number'){return Math.abs(v)>=1e4||(v!==0&&Math.abs(v)<1e-3)?v.toExponential(3):String(+v.toPrecision(6));}
if(typeof v==='object')return JSON.stringify(v);return String(v);}
function verdict(n){var v=n.validation||[];if(!v.length)return'not validated';
return v.every(function(e){return e.passed;})?'passed':'FAILED';}
function period(p){return p.temporal_axis===null||p.temporal_axis===undefined?'':'axis '+p.temporal_axis+(p.period_ms===null?'':', '+fmt(p.period_ms)+' ms');}
function more(p){var m=[];if(p.is_setpoint)m.push('setpoint');if(p.reference)m.push('reference '+p.reference);if(p.expressed_in)m.push('expressed in '+fmt(p.expressed_in));
Object.keys(p.extra||{}).forEach(function(k){m.push(k+'='+fmt(p.extra[k]));});return m.join('; ');}
function portTable(id,ports,withFrom){var h='<table id="'+id+'"><tr><th>port</th><th>shape</th><th>dtype</th><th>kind</th><th>element names</th><th>time axis</th><th>other fields</th>'+(withFrom?'<th>from</th>':'<th>graph output</th>')+'</tr>';
ports.forEach(function(p){h+='<tr data-port="'+esc(p.name)+'"><td>'+esc(p.name)+'</td><td>['+esc(p.shape.join(', '))+']</td><td>'+esc(p.dtype)+'</td><td>'+esc(fmt(p.kind))+'</td><td class="elements">'+esc(p.elements.join(', '))+'</td><td class="period">'+esc(period(p))+'</td><td>'+esc(more(p))+'</td><td>'+
(withFrom?esc((p.from||[]).join('; ')):(p.graph_output?'yes':''))+'</td></tr>';});return h+'</table>';}
function catalogue(c){var groups={},order=[];function add(side,p){var k=p.kind===null||p.kind===undefined?'(no kind)':fmt(p.kind);if(!(k in groups)){groups[k]=[];order.push(k);}groups[k].push([side,p]);}
c.inputs.forEach(function(p){add('input',p);});c.outputs.forEach(function(p){add('output',p);});
order.sort(function(a,b){return(a==='(no kind)')-(b==='(no kind)');});
var h='<h3>Ports by kind</h3><p class="muted" id="frequency">'+(c.frequency===null?'frequency: none (the pipeline\'s configs name no frequency)':'frequency: '+fmt(c.frequency)+' Hz (period '+fmt(1000/c.frequency)+' ms)')+'</p>';
h+='<table id="catalogue"><tr><th>kind</th><th>side</th><th>port</th><th>shape</th><th>dtype</th><th>element names</th><th>time axis</th><th>other fields</th></tr>';
order.forEach(function(k){groups[k].forEach(function(e){var p=e[1];h+='<tr data-key="'+esc(p.key)+'" data-kind="'+esc(k)+'"><td>'+esc(k)+'</td><td>'+e[0]+'</td><td>'+esc(p.key)+'</td><td>['+esc(p.shape.join(', '))+']</td><td>'+esc(p.dtype)+'</td><td class="elements">'+esc(p.elements.join(', '))+'</td><td class="period">'+esc(period(p))+'</td><td>'+esc(more(p))+'</td></tr>';});});
h+='</table>';if(c.feedback.length){h+='<table id="feedback-ports"><tr><th>feedback port</th><th>fed by</th><th>shape</th><th>dtype</th></tr>';
c.feedback.forEach(function(p){h+='<tr data-key="'+esc(p.key)+'"><td>'+esc(p.key)+'</td><td>'+esc(p.source)+'</td><td>['+esc(p.shape.join(', '))+']</td><td>'+esc(p.dtype)+'</td></tr>';});h+='</table>';}
return h;}
function validationTable(n){var v=n.validation||[];
if(!v.length)return'<p class="muted" id="validation">'+(DATA.has_analytics?'no validation analytics for this node (no model)':'no '+esc(DATA.graph)+'_analytics.json: no validation analytics (compiled with validate=False, or by another leapp)')+'</p>';
var h='<table id="validation"><tr><th>sample</th><th>output</th><th>max abs err</th><th>max rel err</th><th>tolerance</th><th>result</th></tr>';
v.forEach(function(e){h+='<tr class="'+(e.passed?'row-pass':'row-fail')+'" data-sample="'+e.sample+'" data-output="'+esc(e.output)+'"><td>'+e.sample+'</td><td>'+esc(e.output)+'</td><td>'+esc(fmt(e.max_abs))+'</td><td>'+esc(fmt(e.max_rel))+
'</td><td>atol '+esc(fmt(e.atol))+' + rtol '+esc(fmt(e.rtol))+'&middot;|ref|</td><td class="'+(e.passed?'pass">pass':'fail">FAIL')+(e.reason?' ('+esc(e.reason)+')':'')+'</td></tr>';});
return h+'</table>';}
function show(name){var n=DATA.nodes[name];if(!n)return;
document.querySelectorAll('g.node').forEach(function(g){g.classList.toggle('selected',g.getAttribute('data-node')===name);});
var p=n.parameters||{};var h='<h2 id="node-title">'+esc(name)+'</h2><div class="muted">backend <b>'+esc(n.backend||'no model')+'</b> &middot; validation <span class="'+(verdict(n)==='FAILED'?'fail':'pass')+'" id="verdict">'+verdict(n)+'</span></div>';
h+='<h3>Model file</h3><table id="model-file"><tr><th>model_path</th><td><code>'+esc(fmt(p.model_path))+'</code></td></tr><tr><th>md5sum</th><td><code>'+esc(fmt(p.md5sum))+'</code></td></tr><tr><th>sha256sum</th><td><code>'+esc(fmt(p.sha256sum))+'</code></td></tr></table>';
h+='<h3>Inputs</h3>'+portTable('inputs',n.inputs,true)+'<h3>Outputs</h3>'+portTable('outputs',n.outputs,false);
h+='<h3>Validation, per sample and output</h3>'+validationTable(n);
h+='<h3>Warnings compile logged for this node</h3>';
h+=n.warnings.length?'<ul id="warnings">'+n.warnings.map(function(w){return'<li class="warning">'+esc(w)+'</li>';}).join('')+'</ul>':'<p class="muted" id="warnings">none</p>';
h+='<h3>Op graph</h3>';
if(!n.ops)h+='<p class="muted">no exported model</p>';
else if(n.ops.error)h+='<p class="fail">cannot read the model: '+esc(n.ops.error)+'</p>';
else h+='<button id="open-ops">Open op graph ('+n.ops.op_count+' ops, '+n.ops.constants.length+' constants)</button><div id="ops"></div>';
panel.innerHTML=h;var b=document.getElementById('open-ops');if(b)b.onclick=function(){openOps(name);};}
function opRow(o){var a=Object.keys(o.attributes||{}).map(function(k){return esc(k)+'='+esc(fmt(o.attributes[k]));}).join(', ');
return'<tr class="op"><td><b>'+esc(o.op)+'</b>'+(o.name?'<br><span class="muted">'+esc(o.name)+'</span>':'')+'</td><td><code>'+esc(o.inputs.join(', '))+'</code></td><td><code>'+esc(o.outputs.join(', '))+'</code></td><td><code>'+a+'</code></td></tr>';}
function openOps(name){var g=DATA.nodes[name].ops,box=document.getElementById('ops');
var h='<div class="muted" id="ops-format">'+esc(g.format)+' &middot; '+g.op_count+' ops'+(g.op_count>g.ops.length?' ('+g.ops.length+' listed)':'')+'</div>';
h+='<details open id="constants-box"><summary>Constants baked into the model ('+g.constants.length+')</summary><table id="constants"><tr><th>name</th><th>shape</th><th>dtype</th><th>values</th></tr>';
g.constants.forEach(function(c){h+='<tr class="constant"><td><code>'+esc(c.name)+'</code>'+(c.source?' <span class="muted">'+esc(c.source)+'</span>':'')+'</td><td>['+esc(c.shape.join(', '))+']</td><td>'+esc(c.dtype)+'</td><td><code>'+esc(c.values.map(fmt).join(', '))+(c.shape.reduce(function(a,b){return a*b;},1)>c.values.length?', ...':'')+'</code></td></tr>';});
h+='</table></details><input id="ops-filter" placeholder="filter ops (type, name, input)">';
var chunk=100;for(var i=0;i<g.ops.length;i+=chunk){var part=g.ops.slice(i,i+chunk);
h+='<details class="op-group"'+(g.ops.length<=chunk*2?' open':'')+'><summary>ops '+(i+1)+'&ndash;'+(i+part.length)+'</summary><table class="ops"><tr><th>op</th><th>inputs</th><th>outputs</th><th>attributes</th></tr>'+part.map(opRow).join('')+'</table></details>';}
box.innerHTML=h;document.getElementById('ops-filter').oninput=function(){var q=this.value.toLowerCase();
box.querySelectorAll('tr.op').forEach(function(r){r.style.display=r.textContent.toLowerCase().indexOf(q)<0?'none':'';});
if(q)box.querySelectorAll('details.op-group').forEach(function(d){d.open=true;});};
box.scrollIntoView();}
document.querySelectorAll('g.node').forEach(function(g){var name=g.getAttribute('data-node'),n=DATA.nodes[name];
if(n&&verdict(n)==='FAILED')g.classList.add('failed');
g.addEventListener('click',function(){show(name);});
g.addEventListener('mousemove',function(ev){tip.style.display='block';tip.style.left=(ev.clientX+12)+'px';tip.style.top=(ev.clientY+12)+'px';
tip.textContent=name+' ('+(n.backend||'no model')+')\n'+n.inputs.length+' inputs, '+n.outputs.length+' outputs\nvalidation: '+verdict(n)+(n.warnings.length?'\n'+n.warnings.length+' warning(s)':'');});
g.addEventListener('mouseleave',function(){tip.style.display='none';});});
var general=DATA.general_warnings||[];var intro='<h2>'+esc(DATA.graph)+'</h2><p class="muted">Click a node for its ports, model file, validation analytics, warnings and op graph.</p>';
var failed=Object.keys(DATA.nodes).filter(function(k){return verdict(DATA.nodes[k])==='FAILED';});
if(failed.length)intro+='<p class="fail" id="failed-nodes">validation failed: '+failed.map(esc).join(', ')+'</p>';
if(DATA.catalogue)intro+=catalogue(DATA.catalogue);
intro+='<h3>System</h3><table>'+Object.keys(DATA.system).map(function(k){return'<tr><th>'+esc(k)+'</th><td>'+esc(fmt(DATA.system[k]))+'</td></tr>';}).join('')+'</table>';
if(general.length)intro+='<h3>Other warnings</h3><ul>'+general.map(function(w){return'<li class="warning">'+esc(w)+'</li>';}).join('')+'</ul>';
panel.innerHTML=intro;window.leappView={show:show,openOps:openOps,data:DATA};
})();
"""


def _json_for_script(data: Any) -> str:
    """JSON that cannot end its <script> element early."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_page(graph: str, svg: str, data: dict[str, Any]) -> str:
    """The self-contained page: style, SVG, panel, data and script."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(graph)} &middot; leapp view</title>"
            f"<style>{STYLE}</style></head><body>"
            f'<div id="canvas">{svg}</div><div id="panel"></div><div id="tip"></div>'
            f'<script type="application/json" id="leapp-data">{_json_for_script(data)}</script>'
            f"<script>{SCRIPT}</script></body></html>\n")
