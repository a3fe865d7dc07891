;;;; An import job shaped like seed 004: each round receives a large octet buffer,
;;;; parses it into many small strings and conses and drops it, while a share of the
;;;; parsed entries accumulates; the last 8 buffers stay referenced, so those a
;;;; collection finds are promoted and die in an older generation. Then it prints its own view of the heap (dynamic usage
;;;; and bytes per generation, as sb-ext counts them) on stderr and idles, allocating
;;;; nothing, so that censuses taken meanwhile can be checked against those figures.
;;;; With "alien" as third argument the buffers are malloc'd (sb-alien) and freed after
;;;; parsing, outside the dynamic space.
;;;; Usage: sbcl --script import_job.lisp ROUNDS IDLE-SECONDS [alien]

(defvar *rounds* (parse-integer (or (second sb-ext:*posix-argv*) "300")))
(defvar *idle* (parse-integer (or (third sb-ext:*posix-argv*) "2")))
(defvar *kept* '())
(defvar *state* (sb-ext:seed-random-state 4))
(defvar *alien* (equal (fourth sb-ext:*posix-argv*) "alien"))
(defvar *recent* (make-array 8 :initial-element nil))

(defun byte-at (buf i)
  (if *alien*
      (sb-alien:deref (the (sb-alien:alien (* (sb-alien:unsigned 8))) (car buf)) i)
      (aref buf i)))

(defun buffer-length (buf)
  (if *alien* (cdr buf) (length buf)))

(defun parse-buffer (buf round)
  (let ((entries '()))
    (dotimes (i 1500 entries)
      (let ((name (make-string (+ 8 (mod (byte-at buf (mod (* i 7) (buffer-length buf))) 24))
                               :initial-element #\n)))
        (setf (char name 0) (code-char (+ 65 (mod round 26))))
        (push (list name (princ-to-string i)) entries)))))

(defun new-buffer (n fill)
  (if *alien*
      (let ((p (sb-alien:make-alien (sb-alien:unsigned 8) n)))
        (sb-alien:alien-funcall
         (sb-alien:extern-alien "memset" (function sb-sys:system-area-pointer
                                                  sb-sys:system-area-pointer
                                                  sb-alien:int sb-alien:unsigned-long))
         (sb-alien:alien-sap p) fill n)
        (cons p n))
      (make-array n :element-type '(unsigned-byte 8) :initial-element fill)))

(dotimes (round *rounds*)
  (let* ((buf (new-buffer (+ 100000 (random 500000 *state*)) (mod round 251)))
         (entries (parse-buffer buf round)))
    (if *alien*
        (sb-alien:free-alien (car buf))
        (setf (aref *recent* (mod round (length *recent*))) buf))
    (when (zerop (mod round 5))
      (push (first entries) *kept*))))

(format *error-output* "dynamic-usage ~D~%" (sb-kernel:dynamic-usage))
(dotimes (g 7)
  (format *error-output* "generation ~D ~D~%" g (sb-ext:generation-bytes-allocated g)))
(format *error-output* "kept ~D~%" (length *kept*))
;; The referenced buffers' bytes in the heap: header and length words, data rounded to
;; two words.
(format *error-output* "recent-octet-bytes ~D~%"
        (if *alien*
            0
            (loop for b across *recent* sum (* 8 (+ 2 (* 2 (ceiling (length b) 16)))))))
(finish-output *error-output*)
(sleep *idle*)
