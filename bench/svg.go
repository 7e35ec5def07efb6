package main

import (
	"fmt"
	"math"
	"strings"
)

// shardSVG draws throughput against shard count (log2 x axis, log10 y
// axis): the measured medians and the ideal shards / 5 ms.
func shardSVG(pts []sweepPoint) string {
	const (
		w, h                   = 640, 400
		left, right, top, bott = 70, 20, 40, 50
	)
	maxY := 0.0
	for _, p := range pts {
		maxY = max(maxY, p.rate, p.ideal)
	}
	minY := math.Inf(1)
	for _, p := range pts {
		minY = min(minY, p.rate, p.ideal)
	}
	y0 := math.Floor(math.Log10(max(minY, 1)))
	y1 := math.Ceil(math.Log10(max(maxY, 10)))
	x0, x1 := math.Log2(float64(pts[0].x)), math.Log2(float64(pts[len(pts)-1].x))
	if x1 == x0 {
		x1 = x0 + 1
	}
	px := func(x int) float64 { return left + (math.Log2(float64(x))-x0)/(x1-x0)*(w-left-right) }
	py := func(v float64) float64 { return h - bott - (math.Log10(max(v, 1))-y0)/(y1-y0)*(h-top-bott) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="14" text-anchor="middle">kscope AtLeastOnce, 5 ms handler: records/s against key-shards</text>`+"\n", w/2)
	for e := y0; e <= y1; e++ {
		y := py(math.Pow(10, e))
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, w-right, y, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, group(int64(math.Pow(10, e))))
	}
	for _, p := range pts {
		x := px(p.x)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#eee"/>`+"\n", x, x, top, h-bott)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%d</text>`+"\n", x, h-bott+16, p.x)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">key-shards (Config.Shards)</text>`+"\n", (left+w-right)/2, h-12)
	fmt.Fprintf(&b, `<text x="16" y="%d" text-anchor="middle" transform="rotate(-90 16 %d)">records/s</text>`+"\n", (top+h-bott)/2, (top+h-bott)/2)
	line := func(val func(sweepPoint) float64, color, dash string) {
		var ps []string
		for _, p := range pts {
			ps = append(ps, fmt.Sprintf("%.1f,%.1f", px(p.x), py(val(p))))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" stroke-dasharray="%s" points="%s"/>`+"\n", color, dash, strings.Join(ps, " "))
		for _, p := range pts {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", px(p.x), py(val(p)), color)
		}
	}
	line(func(p sweepPoint) float64 { return p.ideal }, "#999", "6 4")
	line(func(p sweepPoint) float64 { return p.rate }, "#1f77b4", "none")
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#1f77b4" stroke-width="2"/><text x="%d" y="%d">measured (median of runs)</text>`+"\n", left+10, left+40, top+10, top+10, left+46, top+14)
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#999" stroke-width="2" stroke-dasharray="6 4"/><text x="%d" y="%d">ideal: shards / 5 ms</text>`+"\n", left+10, left+40, top+28, top+28, left+46, top+32)
	b.WriteString("</svg>\n")
	return b.String()
}
