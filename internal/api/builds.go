package api

// Template builds (docs/api.md "Builds (REST)"): build files (the inputs
// of COPY steps, content-addressed by sha256), builds and their events.

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/service"
	"github.com/airlock/airlock/internal/workerapi"
)

func (s *server) putBuildFile(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	hash := r.PathValue("hash")
	if r.ContentLength > model.MaxBuildFileBytes {
		return model.Errorf(model.ErrTooLarge, "the build file is %d bytes; at most %d (%d MiB) are allowed: copy fewer or smaller files in one step", r.ContentLength, int64(model.MaxBuildFileBytes), model.MaxBuildFileBytes>>20)
	}
	f, created, err := s.svc.PutBuildFile(r.Context(), p.OrgID, hash, r.Body, true)
	if errors.Is(err, service.ErrBuildFileHash) {
		return badRequest("%s", err.Error())
	}
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return writeJSON(w, status, apitypes.BuildFile{Hash: f.Key, Size: f.Size})
}

func (s *server) headBuildFile(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	ok, err := s.svc.HasBuildFile(r.Context(), p.OrgID, r.PathValue("hash"))
	if err != nil {
		return err
	}
	if !ok {
		w.WriteHeader(http.StatusNotFound)
		return nil
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

func (s *server) startBuild(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var spec model.BuildSpec
	if err := decode(w, r, &spec, false); err != nil {
		return err
	}
	b, err := s.svc.StartBuild(r.Context(), p, spec)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusAccepted, b)
}

func (s *server) getBuild(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	b, err := s.svc.GetBuild(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, b)
}

func (s *server) listBuilds(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	limit := 0
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return badRequest("limit %q is not a positive integer", v)
		}
		limit = n
	}
	bs, err := s.svc.ListBuilds(r.Context(), p, limit)
	if err != nil {
		return err
	}
	if bs == nil {
		bs = []model.Build{}
	}
	return writeJSON(w, http.StatusOK, apitypes.ListBuildsResponse{Builds: bs})
}

func (s *server) buildEvents(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q := r.URL.Query()
	after := 0
	if v := q.Get("after"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return badRequest("after %q is not a non-negative integer (the last seq seen)", v)
		}
		after = n
	}
	var wait time.Duration
	if v := q.Get("wait"); v != "" {
		d, err := parseWait(v)
		if err != nil {
			return err
		}
		wait = d
	}
	evs, b, err := s.svc.BuildEvents(r.Context(), p, r.PathValue("id"), after, wait)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, apitypes.BuildEvents{Events: evs, State: b.State})
}

// importTemplate is POST /v1/templates?name=NAME[:TAG][&tag=TAG][&ref=REF]:
// the body is an image archive (an OCI layout tar or a docker save
// archive, uncompressed) imported on a worker.
func (s *server) importTemplate(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q := r.URL.Query()
	name, tag, _ := strings.Cut(q.Get("name"), ":")
	if t := q.Get("tag"); t != "" {
		tag = t
	}
	if name == "" {
		return badRequest("name is required: POST /v1/templates?name=NAME[:TAG] with the image archive as the body")
	}
	if r.ContentLength > workerapi.MaxImportBytes {
		return model.Errorf(model.ErrTooLarge, "the image archive is %d bytes; at most %d are allowed", r.ContentLength, int64(workerapi.MaxImportBytes))
	}
	body := http.MaxBytesReader(w, r.Body, workerapi.MaxImportBytes)
	t, err := s.svc.ImportTemplate(r.Context(), p, name, tag, q.Get("ref"), body)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, t)
}
