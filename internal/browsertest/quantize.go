package browsertest

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"sort"
)

// Quantize re-encodes a PNG with a palette of its most frequent colours (at
// most n, 2..256), each other colour mapped to the nearest of them: a page
// of flat colours then compresses to a fraction of its size, small enough
// to keep in the repository.
func Quantize(data []byte, n int) ([]byte, error) {
	if n < 2 || n > 256 {
		return nil, fmt.Errorf("browsertest: %d colours: want 2..256", n)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	b := img.Bounds()
	counts := make(map[color.RGBA]int)
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			counts[color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)]++
		}
	}
	cols := make([]color.RGBA, 0, len(counts))
	for c := range counts {
		cols = append(cols, c)
	}
	sort.Slice(cols, func(i, j int) bool {
		if counts[cols[i]] != counts[cols[j]] {
			return counts[cols[i]] > counts[cols[j]]
		}
		a, c := cols[i], cols[j]
		return a.R < c.R || a.R == c.R && (a.G < c.G || a.G == c.G && a.B < c.B)
	})
	if len(cols) > n {
		cols = cols[:n]
	}
	pal := make(color.Palette, len(cols))
	for i, c := range cols {
		pal[i] = c
	}
	out := image.NewPaletted(b, pal)
	index := make(map[color.RGBA]uint8, len(counts))
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			c := color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)
			i, ok := index[c]
			if !ok {
				i = uint8(pal.Index(c))
				index[c] = i
			}
			out.SetColorIndex(x, y, i)
		}
	}
	var buf bytes.Buffer
	enc := png.Encoder{CompressionLevel: png.BestCompression}
	if err := enc.Encode(&buf, out); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
