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

// page is the page template split at its placeholders.
var pageParts = mustPage()

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

// WritePage writes the page for a View given as JSON (View's encoding, as
// Builder.JSON returns it) titled title: one self-contained HTML file with
// its styles, script and data inline (the data gzip-compressed and
// base64-encoded), which needs no network access.
func WritePage(w io.Writer, title string, viewJSON []byte) error {
	t := html.EscapeString(title)
	out := pageParts.html
	for _, r := range []struct {
		key string
		val []byte
	}{{"{{TITLE}}", []byte(t)}, {"{{CSS}}", pageParts.css}, {"{{JS}}", pageParts.js}} {
		out = bytes.ReplaceAll(out, []byte(r.key), r.val)
	}
	before, after, ok := bytes.Cut(out, []byte("{{DATA}}"))
	if !ok {
		return fmt.Errorf("web: page template lacks its data placeholder")
	}
	// gzip, then base64: the page decodes it with DecompressionStream.
	var z bytes.Buffer
	enc := base64.NewEncoder(base64.StdEncoding, &z)
	gz, err := gzip.NewWriterLevel(enc, gzip.BestSpeed)
	if err != nil {
		return err
	}
	if _, err := gz.Write(viewJSON); err != nil {
		return err
	}
	if err := gz.Close(); err != nil {
		return err
	}
	if err := enc.Close(); err != nil {
		return err
	}
	for _, b := range [][]byte{before, z.Bytes(), after} {
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// WriteHTML writes the Builder's View as a self-contained page.
func (b *Builder) WriteHTML(w io.Writer) error {
	data, err := b.JSON()
	if err != nil {
		return err
	}
	b.mu.Lock()
	title := b.v.Title
	b.mu.Unlock()
	return WritePage(w, title, data)
}

// ReadPage returns the View embedded in a page WritePage wrote.
func ReadPage(page []byte) (View, error) {
	const open = `data-encoding="gzip+base64">`
	_, rest, ok := bytes.Cut(page, []byte(open))
	if !ok {
		return View{}, fmt.Errorf("web: not a siwtun view page: no embedded data")
	}
	data, _, ok := bytes.Cut(rest, []byte("</script>"))
	if !ok {
		return View{}, fmt.Errorf("web: the embedded data is not terminated")
	}
	gz, err := gzip.NewReader(base64.NewDecoder(base64.StdEncoding, bytes.NewReader(bytes.TrimSpace(data))))
	if err != nil {
		return View{}, fmt.Errorf("web: embedded data: %w", err)
	}
	var v View
	if err := json.NewDecoder(gz).Decode(&v); err != nil {
		return View{}, fmt.Errorf("web: embedded data: %w", err)
	}
	return v, nil
}
