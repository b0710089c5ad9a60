package browsertest

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"testing"
)

// TestQuantize checks that a picture of few colours survives exactly and
// that extra colours map to the nearest kept one.
func TestQuantize(t *testing.T) {
	img := image.NewRGBA(image.Rect(0, 0, 40, 10))
	for x := 0; x < 40; x++ {
		for y := 0; y < 10; y++ {
			c := color.RGBA{200, 10, 10, 255}
			if x >= 20 {
				c = color.RGBA{10, 10, 200, 255}
			}
			if x == 39 && y == 9 {
				c = color.RGBA{190, 20, 20, 255} // one near-red pixel
			}
			img.Set(x, y, c)
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		n    int
		want color.RGBA
	}{{2, color.RGBA{200, 10, 10, 255}}, {3, color.RGBA{190, 20, 20, 255}}} {
		out, err := Quantize(buf.Bytes(), tc.n)
		if err != nil {
			t.Fatal(err)
		}
		q, err := png.Decode(bytes.NewReader(out))
		if err != nil {
			t.Fatal(err)
		}
		if got := color.RGBAModel.Convert(q.At(0, 0)); got != (color.RGBA{200, 10, 10, 255}) {
			t.Errorf("n=%d: red became %v", tc.n, got)
		}
		if got := color.RGBAModel.Convert(q.At(39, 9)); got != tc.want {
			t.Errorf("n=%d: the odd pixel became %v, want %v", tc.n, got, tc.want)
		}
	}
	if _, err := Quantize(buf.Bytes(), 1); err == nil {
		t.Error("1 colour accepted")
	}
}
