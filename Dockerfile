FROM python:3.11-slim
WORKDIR /app
COPY . .
RUN pip install --no-cache-dir . \
    && useradd --create-home --uid 1000 memgate \
    && mkdir /data && chown memgate /data && chmod 0700 /data
# not root: /data and the RAM directory in /dev/shm belong to the user that runs memgate
USER memgate
EXPOSE 8080 4222
CMD ["memgate", "up", "--data-dir", "/data", "--http", "0.0.0.0:8080"]
