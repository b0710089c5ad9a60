package web

import (
	"bytes"
	"compress/gzip"
	"embed"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html"
	"io"
)

//go:embed assets/page.html assets/page.css assets/page.js
var assets embed.FS

// pageParts are the page's template, styles and script.
var pageParts = mustPage()

// pageTemplate holds the embedded assets.
type pageTemplate struct {
	html, css, js []byte
}

func mustPage() pageTemplate {
	read := func(name string) []byte {
		b, err := assets.ReadFile(name)
		if err != nil {
			panic(fmt.Sprintf("web: embedded %s: %v", name, err))
		}
		return b
	}
	return pageTemplate{read("assets/page.html"), read("assets/page.css"), read("assets/page.js")}
}

// detail is the part of a Segment the page reads only when the segment
// is chosen: one line of the page's detail data per segment.
type detail struct {
	FPDUs   []FPDU   `json:"fp,omitempty"`
	Markers []Marker `json:"mk,omitempty"`
	Map     []Span   `json:"map,omitempty"`
}

// WritePage writes the page for v: one self-contained HTML file with its
// styles, script and data inline, which needs no network access. The data
// is two blocks: the View as JSON without the segments' FPDUs, Markers and
// byte maps, and those as one JSON line per segment, gzip-compressed and
// base64-encoded, which the page decodes after it has drawn the ladder and
// parses only for the segment chosen. So a trace of many segments costs
// the HTML parser and the page's memory little.
func WritePage(w io.Writer, v *View) error {
	light := *v
	light.Segments = make([]Segment, len(v.Segments))
	var details bytes.Buffer
	enc := json.NewEncoder(&details)
	for i := range v.Segments {
		s := v.Segments[i]
		if err := enc.Encode(detail{s.FPDUs, s.Markers, s.Map}); err != nil {
			return err
		}
		s.FPDUs, s.Markers, s.Map = nil, nil, nil
		light.Segments[i] = s
	}
	viewJSON, err := json.Marshal(&light)
	if err != nil {
		return err
	}
	out := pageParts.html
	for _, r := range []struct {
		key string
		val []byte
	}{{"{{TITLE}}", []byte(html.EscapeString(v.Title))}, {"{{CSS}}", pageParts.css}, {"{{JS}}", pageParts.js}} {
		out = bytes.ReplaceAll(out, []byte(r.key), r.val)
	}
	before, rest, ok := bytes.Cut(out, []byte("{{DATA}}"))
	if !ok {
		return fmt.Errorf("web: page template lacks its data placeholder")
	}
	middle, after, ok := bytes.Cut(rest, []byte("{{DETAIL}}"))
	if !ok {
		return fmt.Errorf("web: page template lacks its detail placeholder")
	}
	// encoding/json escapes <, > and &: the data cannot end its script
	// element.
	data := viewJSON
	det, err := gzip64(details.Bytes())
	if err != nil {
		return err
	}
	for _, b := range [][]byte{before, data, middle, det, after} {
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// gzip64 compresses p with gzip and encodes it in base64: the page decodes
// it with DecompressionStream.
func gzip64(p []byte) ([]byte, error) {
	var z bytes.Buffer
	enc := base64.NewEncoder(base64.StdEncoding, &z)
	gz, err := gzip.NewWriterLevel(enc, gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	if _, err := gz.Write(p); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return z.Bytes(), nil
}

// WriteHTML writes the Builder's View as a self-contained page.
func (b *Builder) WriteHTML(w io.Writer) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return WritePage(w, &b.v)
}

// ReadPage returns the View embedded in a page WritePage wrote.
func ReadPage(page []byte) (View, error) {
	block := func(id string) (io.Reader, error) {
		_, rest, ok := bytes.Cut(page, []byte(`<script id="`+id+`" `))
		if !ok {
			return nil, fmt.Errorf("web: not a siwtun view page: no %s", id)
		}
		attrs, rest, ok := bytes.Cut(rest, []byte(">"))
		if !ok {
			return nil, fmt.Errorf("web: %s is not terminated", id)
		}
		data, _, ok := bytes.Cut(rest, []byte("</script>"))
		if !ok {
			return nil, fmt.Errorf("web: %s is not terminated", id)
		}
		if !bytes.Contains(attrs, []byte(`data-encoding="gzip+base64"`)) {
			return bytes.NewReader(data), nil
		}
		return gzip.NewReader(base64.NewDecoder(base64.StdEncoding, bytes.NewReader(bytes.TrimSpace(data))))
	}
	var v View
	r, err := block("siwtun-data")
	if err != nil {
		return View{}, err
	}
	if err := json.NewDecoder(r).Decode(&v); err != nil {
		return View{}, fmt.Errorf("web: embedded data: %w", err)
	}
	if r, err = block("siwtun-detail"); err != nil {
		return View{}, err
	}
	dec := json.NewDecoder(r)
	for i := range v.Segments {
		var d detail
		if err := dec.Decode(&d); err != nil {
			return View{}, fmt.Errorf("web: embedded detail of segment %d: %w", i, err)
		}
		s := &v.Segments[i]
		s.FPDUs, s.Markers, s.Map = d.FPDUs, d.Markers, d.Map
	}
	return v, nil
}
